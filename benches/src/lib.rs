//! chorus-benches (floor 5): criterion micro-benchmarks and the side-by-side comparisons
//! against Gloo, Open MPI and NCCL. Nothing imports it.
