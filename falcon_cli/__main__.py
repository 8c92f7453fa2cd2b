"""``python -m falcon_cli`` is the same as the ``falcon`` command."""

from falcon_cli.cli.app import main

main()
