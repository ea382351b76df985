"""`python -m splitserve` == the `splitserve` command."""

from splitserve.cli.main import main

main()
