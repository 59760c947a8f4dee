"""Design what-if: cost, scaling efficiency and availability of fabric designs (issue 13).

Pure analysis over the fabric builders and the flow simulator: no sockets, no DB, no CLI.
``spec`` sizes a design at a GPU count, ``bom`` prices it from a ``catalog``, ``blast``
measures what each component's failure takes out, ``reliability`` and ``montecarlo`` turn
failure rates into interruptions, checkpoint intervals, goodput and availability, and
``scaling`` runs a training step on the simulator. ``compare`` joins them.
"""
