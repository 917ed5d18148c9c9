"""The capability suite: six tasks (and three extras) scored per item, two arms joined item by item,
paired statistics."""
