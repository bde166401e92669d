mod loadaware;
