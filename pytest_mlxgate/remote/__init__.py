"""Arms served over HTTP: a model behind an OpenAI-compatible server (mlx_lm.server and its kin), asked for
greedy continuations and their top-k log-probabilities, checked, and scored against the gate's other arm."""
