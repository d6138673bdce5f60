/**
 * One notebook's klbr connection, as the status item and the plugin see it: the kernel's state, asking
 * the kernel, replaying a cell. On every connection to a klbr kernel (`KernelLink`) it says hello and
 * restores the notebook (`Restore`); the kernel's pushes go to the state or to the followed cells
 * (`Following`). Disposed with its notebook.
 */

import type { NotebookPanel } from '@jupyterlab/notebook';
import type { Kernel } from '@jupyterlab/services';
import type { JSONObject } from '@lumino/coreutils';
import { ISignal, Signal } from '@lumino/signaling';

import { codeCell } from './cells';
import { KlbrComm, KlbrError } from './comm';
import { Following } from './following';
import { KernelLink, openKlbrComm } from './link';
import { IKernelState, isKernelState } from './messages';
import { tellNotebook } from './notebook';
import { RebuildOffer } from './rebuild';
import { Restore } from './restore';
import { upgradeForCellIds } from './upgrade';

export class KlbrConnection {
  constructor(readonly panel: NotebookPanel) {
    this._following = new Following(cellId => codeCell(panel.content, cellId));
    this._restore = new Restore(panel, this._following);
    // What the status item shows of the offer follows the plan as it is read.
    this.rebuild = new RebuildOffer(panel, op => this.request(op), () => this._stateChanged.emit(this._state));
    this._link = new KernelLink(panel.sessionContext, window, openKlbrComm, {
      kernelChanged: () => {
        this.rebuild.kernelChanged();
        this._setState(null);
      },
      opened: comm => this._opened(comm),
      closed: () => this._following.clear(),
      state: state => this._takeState(state),
      output: push => this._following.output(push),
      ended: push => this._following.ended(push)
    });
    panel.disposed.connect(this.dispose, this);
    // A rename, a move, a save-as: the kernel files the session under the new path.
    panel.context.pathChanged.connect(this._pathChanged, this);
  }

  /** The way back after a generation ends: its offer, and the earlier-generation cell marks. */
  readonly rebuild: RebuildOffer;

  /** The kernel's state, once a klbr kernel has said hello; null for other kernels. */
  get state(): IKernelState | null {
    return this._state;
  }

  get stateChanged(): ISignal<this, IKernelState | null> {
    return this._stateChanged;
  }

  /** Restored cells so far (the tests read this through the DOM's data attributes as well). */
  get restored(): number {
    return this._restore.restored;
  }

  get isDisposed(): boolean {
    return this._link.isDisposed;
  }

  /** Ask the kernel: one request, its answer's data. */
  request(op: string, fields: JSONObject = {}): Promise<JSONObject> {
    return this._comm().then(comm => comm.request(op, fields));
  }

  /** Ask the kernel for its state now (what `%klbr status` shows changes by the second). */
  async hello(): Promise<IKernelState> {
    return this._hello(await this._comm());
  }

  /** Put the recorded outputs of the selected cell into it, whatever it shows now. */
  async replayCell(cellId: string): Promise<boolean> {
    return this._restore.replayCell(await this._comm(), cellId);
  }

  /** The notebook went: its comm closes, and nothing of it is listened to any more. */
  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    this._link.dispose();
    this.rebuild.dispose();
    Signal.clearData(this);
  }

  private _comm(): Promise<KlbrComm> {
    const comm = this._link.comm;
    if (comm === null || !comm.isOpen) {
      return Promise.reject(new KlbrError('NotConnected', 'no klbr comm is open'));
    }
    return Promise.resolve(comm);
  }

  private async _hello(comm: KlbrComm): Promise<IKernelState> {
    const answer = await comm.request('hello');
    if (!isKernelState(answer)) {
      throw new KlbrError('MalformedAnswer', 'the hello answer is not a kernel state');
    }
    return this._takeState(answer);
  }

  private async _opened(comm: KlbrComm): Promise<void> {
    if (!this._upgraded) {
      this._upgraded = upgradeForCellIds(this.panel.context.model);
    }
    try {
      await this._hello(comm);
      await tellNotebook(comm, this.panel);
      const first = !this._connectedOnce;
      this._connectedOnce = true;
      await this._restore.run(comm, first);
    } catch (error) {
      console.warn('klbr: the kernel did not answer the klbr comm', error);
    }
  }

  private _pathChanged(): void {
    const comm = this._link.comm;
    if (comm !== null && comm.isOpen) {
      void tellNotebook(comm, this.panel);
    }
  }

  /** What the kernel said of itself, over what it said before (an older kernel leaves fields out). */
  private _takeState(state: IKernelState): IKernelState {
    const merged = this._state !== null ? { ...this._state, ...state } : state;
    this._setState(merged);
    this.rebuild.generationSeen(merged.generation);
    return merged;
  }

  private _setState(state: IKernelState | null): void {
    this._state = state;
    this._stateChanged.emit(state);
  }

  private readonly _following: Following;
  private readonly _restore: Restore;
  private readonly _link: KernelLink<Kernel.IKernelConnection>;
  private _state: IKernelState | null = null;
  private _stateChanged = new Signal<this, IKernelState | null>(this);
  private _connectedOnce = false;
  private _upgraded = false;
}
