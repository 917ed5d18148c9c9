"""Statistics: the interval core (t, normal, Wilson, cluster bootstrap), KL statistics over
sequences, the paired tests of capability gates, and the sequential (anytime-valid) capability gate."""
