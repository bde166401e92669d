mod batch;
mod strategy;
mod sync;
