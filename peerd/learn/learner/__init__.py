"""Learners: who trains a node's model in weight mode (the contract is
:mod:`peerd.learn.learner.contract`; ``[learner] kind`` picks one)."""
