"""Results, standard library only (the xdist controller imports them): the gate record (its wire form and
the typed read model every reader parses it into), the JSON report, the sqlite history, the Capability
Score, the summary table, JUnit, GitHub and HTML outputs."""
