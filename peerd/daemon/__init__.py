"""The daemon: wiring only — configuration, the `peerd run` process that connects the
stages (net → node → store → learn → control), sd_notify and process-wide memory settings.

Every decision is delegated to a tested module of another stage; code that decides something
does not belong here.
"""
