"""The operator's closed control loop: router / worker signals -> autoscaler and flipper ->
pool sizes, flips, status, Events and metrics (`loop`); the observation window over router
metrics (`signals`); the `/metrics` + `/healthz` endpoint (`server`)."""
