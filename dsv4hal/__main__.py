"""`python3 -m dsv4hal ...`: the command line, when the `dsv4hal` script on PATH is not this install's."""

from dsv4hal.cli import main

raise SystemExit(main())
