"""The machine: which device a trial is measured on, NVML loaded safely, the memory meters (NVML on a GPU,
RSS on the CPU), and ``autotune doctor``'s checks."""
