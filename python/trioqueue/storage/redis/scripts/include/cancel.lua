-- End a claimed job (already out of its processing list) as cancelled.
local function cancel_claimed(id, m, now, W)
  m.s = nil
  m.x = nil
  ev('cancelled', id, W, nil, nil, m.i)
  terminal(id, m, now, m.t or 0, 'cancelled:' .. istr(now), '')
end
