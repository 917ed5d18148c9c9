"""Configuration: the option table (flags, ini twins, checks), settings with their precedence,
model names and aliases, and the re-run command."""
