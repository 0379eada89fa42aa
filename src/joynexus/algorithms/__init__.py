"""Learning algorithms that run inside the service: advantage estimators, RL losses."""
