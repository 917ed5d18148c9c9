"""Statistics: the interval core (t, normal, Wilson, cluster bootstrap), KL statistics over
sequences, and the paired tests of capability gates."""
