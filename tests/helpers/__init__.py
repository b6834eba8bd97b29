"""What tests share: fakes that satisfy the production protocols (checked by mypy in
``make lint``), ports, and waits with deadlines. Import as ``from helpers.fake_store import
FakeStore`` (``tests/`` is on ``sys.path``: its conftest puts it there)."""
