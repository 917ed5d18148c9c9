"""Speed and memory beside drift: both arms of a lever timed in one process, interleaved, paired."""
