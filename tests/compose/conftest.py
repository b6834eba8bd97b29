"""tests/compose: the compose cluster in a real engine; the session fixture and its helpers
are in ``compose_harness``."""

from compose_harness import compose_cluster  # noqa: F401 - the module fixture: down -v once the module ends, not the whole run
