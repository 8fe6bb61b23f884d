"""`python -m sidecar.cli`: the same entry point as the `sidecar` command."""

from sidecar.cli.main import main

raise SystemExit(main())
