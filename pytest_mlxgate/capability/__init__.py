"""The capability suite: six tasks scored per item, two arms joined item by item, paired statistics."""
