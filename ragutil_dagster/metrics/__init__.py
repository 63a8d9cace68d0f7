"""Pure metric library: numpy / scipy / pytrec_eval only — importing it loads neither torch nor Dagster.

One module per paper (``seper``, ``mirage``, ``consens``, ``erag``, ``utility``) plus the shared
``answers``, ``ranking`` and ``stats``. Import the modules directly, e.g.
``from ragutil_dagster.metrics import seper``.
"""
