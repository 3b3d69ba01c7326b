-- ARGV: slice. Forgets up to `slice` expired terminal jobs; returns how many (the caller
-- repeats while a full slice was swept, so one call never blocks the server for long).
--@include prelude
return sweep(now_ms(), tonumber(ARGV[1]))
