//! The `chorus` command (floor 5): `run`, `bench`, `status`. Nothing imports it.

fn main() {}
