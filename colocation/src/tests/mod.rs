mod batch;
mod slo;
mod strategy;
mod sync;
