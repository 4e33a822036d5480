-- An attempt an operator cancelled while its handler ran. The cancel writes it (worker,
-- start, the cancel's time), so a job cancelled mid-run shows the attempt it ran; the
-- handler's own result, written later, matches no lease and is discarded.
ALTER TYPE tock_attempt_outcome ADD VALUE IF NOT EXISTS 'cancelled';
