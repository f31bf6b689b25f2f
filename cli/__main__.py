"""``python -m peerd.cli`` runs the same app as the ``peerd`` console script."""

from peerd.cli.app import main

main()
