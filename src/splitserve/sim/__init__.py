"""Vidur-style discrete-event simulator running the live policy objects.

Layout: `events` (frozen events, the ordered queue), `engine` (the loop and its clock),
`entities` (requests, workers, pools, router), `cluster` (the world and `simulate`), `workload`
(arrivals, lengths, traces), `metrics` (TTFT/TPOT/attainment/goodput), `report` (tables, plots),
`config` (scenario and cluster files), `validate` (replaying a recorded run: simulated vs
measured), `reproductions/` (one module per paper: set-ups and headline comparisons), `traces/`
(the bundled Azure traces), `runner` and `bench` (the only modules doing I/O or reading wall
time). Nothing is global: two simulators can run in one process.
"""
