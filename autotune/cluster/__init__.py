"""Trials placed on a cluster an engine users already run (Ray): one node's share of a trial
(``node``), and the executor that places each trial in a Ray placement group (``ray_executor``, which alone
imports Ray)."""
