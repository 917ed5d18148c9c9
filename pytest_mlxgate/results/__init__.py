"""Results, standard library only (the xdist controller imports them): the typed gate record, the
JSON report, the sqlite history, the Capability Score and the summary table."""
