"""``python -m turbine``: ``demo`` runs the README example; ``info`` prints versions and devices."""

from __future__ import annotations

import argparse
import importlib.metadata
import sys


def demo(device: str) -> int:
    """The README's example on one device, checked against torch on the CPU."""
    import torch

    import turbine

    torch.manual_seed(0)
    x = torch.randn(64, 128, device=device)
    w = torch.randn(128, 32, device=device)
    y = torch.relu(x @ w + 1.0)
    v, i = torch.max(y, dim=1)
    print(y.device, v.cpu()[:4], i.dtype)
    expected = torch.relu(x.cpu() @ w.cpu() + 1.0).max(dim=1)
    torch.testing.assert_close(v.cpu(), expected.values, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(i.cpu(), expected.indices)
    print(f"matches torch on the CPU; {turbine.stats()['kernels_compiled']} kernels compiled")
    return 0


def info() -> int:
    import turbine

    for package in ("turbine-eager", "torch", "iree-base-compiler", "iree-base-runtime"):
        try:
            version = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            version = "not installed" if package != "turbine-eager" else turbine.__version__ + " (source tree)"
        print(f"{package:20} {version}")
    import iree.runtime as rt

    from turbine.kernels_cache import compiler_version

    print(f"{'IREE compiler':20} {compiler_version()}")

    print(f"{'IREE drivers':20} {', '.join(rt.query_available_drivers())}")
    print(f"{'turbine devices':20} {', '.join(turbine.devices())}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m turbine", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    run_demo = commands.add_parser("demo", help="run the README example and compare with torch on the CPU")
    run_demo.add_argument("--device", default="turbine:cpu")
    commands.add_parser("info", help="versions of turbine, torch and IREE; drivers and devices")
    args = parser.parse_args(argv)
    if args.command == "demo":
        return demo(args.device)
    return info()


if __name__ == "__main__":
    sys.exit(main())
