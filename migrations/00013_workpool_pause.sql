-- +goose Up
-- A paused pool accepts work but starts none (issue 13). The flag lives in
-- the pool row, which every iteration of the pool's loop already locks and
-- reads (the generation bump), so a pause holds across restarts and
-- replicas, and no start commits after the pause does.
ALTER TABLE workpool_pools ADD COLUMN paused boolean NOT NULL DEFAULT false;

-- +goose Down
ALTER TABLE workpool_pools DROP COLUMN paused;
