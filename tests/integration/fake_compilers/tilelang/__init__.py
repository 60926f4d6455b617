"""Stand-in for the real tilelang, put on sys.path by the integration tests: if anything imports
it while tileops loads backends, it shows up in sys.modules."""
