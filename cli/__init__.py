"""The ``peerd`` command line (installed as ``peerd.cli``). ``app.py`` only registers commands."""
