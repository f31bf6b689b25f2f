"""The ``peerd`` command line (installed as ``peerd.cli``). ``app.py`` only registers commands.

Each command is one thin module: it parses options, calls into the package and prints. File
formats, the wire and the status schema belong to the package; no command parses them itself.
"""
