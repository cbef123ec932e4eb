"""Entry points: the command line and the start-up order of one operator process."""
