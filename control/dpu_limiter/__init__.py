"""dpu-limiter: caps the bandwidth between accelerator pods by programming P4 data planes."""
