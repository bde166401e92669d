mod cache;
mod loadaware;
