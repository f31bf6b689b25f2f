"""An external learner (``[learner] kind = "external"``): a plain training loop of the
user's, started by hand, attached to a running peerd daemon (docs/learners.md)."""
