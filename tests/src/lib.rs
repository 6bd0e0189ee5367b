//! chorus-tests (floor 5): multi-process and fault-injection tests of the real binaries on
//! loopback. Nothing imports it.
