"""Admission control: whether a request may queue, judged from what its model version's batcher shows
(``view.QueueView``), the measured costs, the event loop's lag and what recent requests took. Pure of
the event loop: every judgement is given the time (docs/batching.md, "Latency objective and
admission control")."""
