"""``posenc profile``: what an encoding costs (FLOPs, memory, latency) and how the cost grows.

``flops`` counts operations, ``memory`` tracks peak tensor memory, ``timing`` measures latency,
``workloads`` builds the module to measure (one attention layer or a whole model from a recipe),
``sweep`` runs them over sizes and encodings and ``report`` turns the records into tables,
JSON and log-log plots.
"""
