SELECT nextval('{schema}.job_seq')
