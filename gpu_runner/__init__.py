"""gpu_runner: executes a real small transformer under core's scheduler and block manager
and writes measured `serving-trace/1` traces. The only package that imports torch/triton;
the app never imports it. Importing the package itself is cheap (no torch): `loadgen` and
`serve -h` need none of it. Triton's CPU interpreter switch (TRITON_INTERPRET) is set by
gpu_runner.kernels.triton_attention, the only module that imports triton, before it does."""
