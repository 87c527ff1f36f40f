-- +goose Up

-- The generator's started/stopped switch: one row, whichever replica is
-- asked changes it, and every replica hears of it on leasehold_generator.
CREATE TABLE generator_state (
    id         integer     PRIMARY KEY DEFAULT 1 CHECK (id = 1),
    started    boolean     NOT NULL DEFAULT false,
    changed_at timestamptz NOT NULL DEFAULT now(),
    changed_by text        NOT NULL DEFAULT ''
);
INSERT INTO generator_state DEFAULT VALUES;

CREATE FUNCTION generator_state_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('leasehold_generator', CASE WHEN NEW.started THEN 'STARTED' ELSE 'STOPPED' END);
    RETURN NULL;
END;
$$;

CREATE TRIGGER generator_state_changed
    AFTER UPDATE ON generator_state
    FOR EACH ROW EXECUTE FUNCTION generator_state_changed();

-- What each replica says about itself. It is alive while it holds the
-- lease 'instance:<id>'.
CREATE TABLE instances (
    id         text        PRIMARY KEY,
    addr       text        NOT NULL,
    roles      text[]      NOT NULL,
    version    text        NOT NULL,
    started_at timestamptz NOT NULL DEFAULT now()
);

-- +goose Down
DROP TABLE instances;
DROP TABLE generator_state;
DROP FUNCTION generator_state_changed();
