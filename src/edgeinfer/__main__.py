"""Allow ``python -m edgeinfer``."""

from edgeinfer.cli import main

raise SystemExit(main())
