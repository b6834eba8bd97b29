"""The web console (``replog console``): the cluster, its topics and messages, and its
failovers as they happen, read with the same requests the command line makes
(``collector.py``, ``actions.py``) and served as pages from the package (``server.py``,
``static/``)."""
