"""One run's state (the session plugin), the builder of a gate module's paired run, and the
`paired` fixture's value."""
