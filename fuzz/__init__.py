"""Coverage-guided fuzz harnesses (atheris): one file per target; see fuzz/_harness.py."""
