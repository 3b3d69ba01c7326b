CREATE SCHEMA IF NOT EXISTS {s};CREATE TABLE {s}.version (version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())
