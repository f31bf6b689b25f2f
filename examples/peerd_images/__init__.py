"""A python learner over a folder of image files: a small CNN, AdamW with a cosine schedule,
the device peerd gives it (see docs/learners.md)."""
