"""An example of a user's own peerd task: a custom torch model over a folder of files.

``[task] name = "peerd_signals.task:task"`` with this directory's parent on ``PYTHONPATH``
(docs/tasks.md walks through it). Nothing here is part of peerd: it only uses peerd's task
interface (:class:`peerd.learn.tasks.Task`), as a user's package would.
"""
