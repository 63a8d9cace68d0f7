"""Machinery no metric knows about: atomic writes and stable hashes, ``$RAGUTIL_HOME`` paths
(``files``), artifacts on any fsspec URL (``objectstore``), the databases' environment variables
(``databases``), locks and claims (``locks``), child processes (``processes``), crash points for
tests (``failpoints``), secrets kept out of messages (``redaction``), library versions in cache
keys (``versions``). Each imports only ``errors`` and the other modules here."""
