"""gpu_runner: executes a real small transformer under core's scheduler and block manager
and writes measured `serving-trace/1` traces. The only package that imports torch/triton;
the app never imports it. (Its engine, model and kernels land with the runner issues.)"""
