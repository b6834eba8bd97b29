"""POP consumption's store side: the state of each (group, topic, queue) read by POP, kept from
the revive topic's records (``state.py``, ``records.py``, ``service.py``)."""
